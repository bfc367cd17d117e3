"""ds4d.daemon."""
