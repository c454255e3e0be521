"""ESPN (embedding from storage pipelined network) hardware: the MaxSim re-ranking unit.

:mod:`.golden` is the int64 numpy golden model (``maxsim_scores``) and the int8 quantisation
(``quantize_int8``) shared with the host pipeline; :mod:`.maxsim` the configuration and the
Amaranth component; :mod:`.model` the stream model the simulation flow drives. Importing this
package imports no gateware.
"""
