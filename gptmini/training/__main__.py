from gptmini.training.app import main

main()
