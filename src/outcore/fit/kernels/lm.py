"""The rules of the Levenberg-Marquardt fits shared by the array code (``arrays``, both
twins) and the host's compiled loop (``compiled``): status codes, damping constants, the
singularity threshold."""

#: Status of a fit, by code: the code is the index (kept as a float in the packed output).
STATUS_NAMES = (
    "converged_f_tol",  # relative chi2 change, actual and predicted, below f_tol
    "converged_x_tol",  # scaled step below x_tol times the scaled parameter norm
    "converged_g_tol",  # largest gradient cosine below g_tol
    "max_iterations",  # max_iterations steps without convergence; parameters are the last ones
    "singular",  # normal matrix not invertible while stepping or at the solution; errors NaN
    "invalid_input",  # bad pixels or too few of them; everything NaN
)
STATUS = {name: code for code, name in enumerate(STATUS_NAMES)}

LAMBDA_START = 1e-3
LAMBDA_UP = 10.0
LAMBDA_DOWN = 10.0
LAMBDA_RANGE = (1e-12, 1e16)
#: A (Jacobi-scaled) normal matrix whose eigenvalue ratio falls below this is singular.
SINGULAR_RCOND = 1e-12
