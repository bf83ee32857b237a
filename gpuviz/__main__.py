from gpuviz.frontends.cli import main

raise SystemExit(main())
