"""ds4d.state."""
