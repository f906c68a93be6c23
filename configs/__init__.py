"""The sweep presets, shipped as package data (`attnbench.configs`); `attnbench presets` lists them."""
