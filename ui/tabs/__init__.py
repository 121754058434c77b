"""The app's tabs, one module each (Run, Compare, Plan, Evaluate, Compress): each builds its
part of the page and wires its events. Shared pieces (figures, views, inputs, documents)
live beside this folder in ui/."""
