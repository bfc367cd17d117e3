"""ds4d: a local inference daemon for coding agents that treats the KV state of a prompt
prefix as an asset (resident slots, disk checkpoints kept across restarts)."""

__version__ = "0.1.0"
