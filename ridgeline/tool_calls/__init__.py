"""Tool calling: the call formats of model families (formats.py), which one a chat template uses
(detect.py), one incremental parser per format for streamed and whole outputs (parser.py), the
grammar that constrains a reply to calls (grammar.py), and a request's tools, tool_choice and tool
messages checked and made into template input (request.py)."""
