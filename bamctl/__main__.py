from bamctl.cli import entry

entry()
