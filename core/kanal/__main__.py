from kanal.cli import main

raise SystemExit(main())
