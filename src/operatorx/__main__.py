"""`python -m operatorx` — same as the `operatorx` console script."""

from operatorx.entry import main

if __name__ == "__main__":
    main()
