"""Plain numpy reference implementations the native code is checked against (tests only)."""
