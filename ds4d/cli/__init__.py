"""The `ds4d` command: its entry point (`main.py`, which dispatches the subcommands and maps
their failures to exit codes) and the one-shot `ds4d generate`. The exit codes live in
ds4d/daemon/exitcodes.py, beside the daemon that raises them, below this package."""
