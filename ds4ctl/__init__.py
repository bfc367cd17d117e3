"""ds4ctl: admin client of the ds4d Unix socket."""
