from ds4d.cli import main

raise SystemExit(main())
