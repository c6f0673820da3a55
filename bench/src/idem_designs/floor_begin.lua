-- The floor of any two-script first execution: a begin that answers "started" at once.
return {0}
