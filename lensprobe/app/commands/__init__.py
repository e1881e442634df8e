"""One module per ``lensprobe`` subcommand, each with an ``add_<name>(subparsers)`` function."""
