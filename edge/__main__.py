from edge.cli import main

raise SystemExit(main())
