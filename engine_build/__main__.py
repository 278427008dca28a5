import os
import sys

# Before torch is imported: see serving.tritonserver.server_environment.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from engine_build.cli import main

sys.exit(main())
