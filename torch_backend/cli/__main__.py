from torch_backend.cli import command

command()
