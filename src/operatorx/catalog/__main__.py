"""`python -m operatorx.catalog`: rewrite the shipped testlists from the catalog."""

from pathlib import Path

import operatorx
from operatorx.catalog.testlists import write_shipped

out = Path(operatorx.__file__).parent / "testlists"
for name, count in write_shipped(out).items():
    print(f"{name}: {count} cases")
