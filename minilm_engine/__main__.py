from minilm_engine.entrypoints.cli.main import main

raise SystemExit(main())
