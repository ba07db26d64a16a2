"""``python -m conveyor``: the same CLI as the ``conveyor`` command."""

from conveyor.cli.main import main

if __name__ == "__main__":
    main()
