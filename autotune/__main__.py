from autotune.cli._main import main

main()
