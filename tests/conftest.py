import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["pytester"]

# pytester's in-process runs forget every module imported during them, so a module that registers a torch
# operator library at import (torch._dynamo, which an optimizer step imports lazily) would register twice
# in the next run; imported once here, it stays. (In-process runs instead of subprocesses: about 5 s each.)
import torch._dynamo  # noqa: E402, F401
