from engine_build.cli import main
import sys
sys.exit(main())
