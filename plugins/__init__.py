"""The built-in vecaccel plugins (backends and env registration), registered like any other."""
