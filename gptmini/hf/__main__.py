from gptmini.hf.cli import main

raise SystemExit(main())
