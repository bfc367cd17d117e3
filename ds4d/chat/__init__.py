"""ds4d.chat."""
