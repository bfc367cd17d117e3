from ds4d.cli.main import main

raise SystemExit(main())
