from rqcli.console import main

main()
