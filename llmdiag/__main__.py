from llmdiag.cli import main

main()
