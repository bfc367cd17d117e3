"""Developer tools, reached through the `ds4d` command but not part of serving: the speed
sweep (`ds4d bench`) and its decode profile, the serving benchmark (`ds4d bench serve`),
the synthetic GGUF writer (`ds4d synth-gguf`), and the helper that starts a `ds4d serve`
child for what drives one from outside (the serving benchmark, scripts, end-to-end
tests)."""
