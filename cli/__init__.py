"""The `koordstream` command: parses arguments and calls into the packages."""
