"""A run's files and their discovery, in one place (docs/development.md lists the modules)."""
