from bamctl.cli import main

main()
