"""`python -m operatorx` — same as the `operatorx` console script."""

from operatorx.cli import main

if __name__ == "__main__":
    main()
