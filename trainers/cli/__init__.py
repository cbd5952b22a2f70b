"""The command line of the trainers: ``vecaccel train`` and ``vecaccel eval``."""
