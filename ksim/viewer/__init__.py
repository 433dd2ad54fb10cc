"""`mode=view`'s web page: the simulation a policy acts in live (sim) and the page that shows it (server).

What a task tells the viewer, and the checks on its settings, live below the task in `ksim.viewer_settings`.
"""
