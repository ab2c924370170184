"""The ``nanopy`` command line (private): subcommands live in their own modules."""
