from rqcli.main import main

main()
