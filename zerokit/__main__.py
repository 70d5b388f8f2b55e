from zerokit.cli import main

raise SystemExit(main())
