"""ds4d.api."""
