from egpu_setup.cli import main

main()
