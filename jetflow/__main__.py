from jetflow.cli import main

raise SystemExit(main())
