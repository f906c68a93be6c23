import a_library_that_is_not_installed  # noqa: F401  (the point of this plugin)
