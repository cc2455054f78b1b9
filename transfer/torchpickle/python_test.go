package torchpickle

// pythonPath is the interpreter with Debian's python3-torch (CI installs it).
const pythonPath = "/usr/bin/python3"
