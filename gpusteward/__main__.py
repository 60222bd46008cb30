from gpusteward.cli import main

raise SystemExit(main())
