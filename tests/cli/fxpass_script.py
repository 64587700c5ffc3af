"""What the installed ``fxpass`` console script runs. Run as a file, it puts this folder —
not the current one — first on ``sys.path``, exactly like the script (``python -m`` would
add the current folder and hide import-path bugs)."""

from fxpass.cli import main

main()
