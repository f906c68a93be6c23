"""`attnbench reproduce`: published claims of the methods attnbench measures, checked against runs made here."""
