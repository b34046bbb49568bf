from gptmini.training.run.app import main

main()
