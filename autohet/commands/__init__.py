"""CLI subcommands: each module has register(subparsers)."""
