"""``python -m fxpass``: the fxpass command."""

from fxpass.cli import main

if __name__ == "__main__":
    main()
