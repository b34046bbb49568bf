from gptmini.hf.gpt2 import main

raise SystemExit(main())
