import os
import sys

# Tests count compiles: no persistent cache unless a test asks for one.
os.environ.setdefault("TORCH_TPU_CACHE_DIR", "")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
