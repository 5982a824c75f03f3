# Read by CTest after the discovered unit tests: the longest ones (73, 23 and 19 s under ASan, where the others take
# about a second) carry a COST, so that CTest starts them first even where it has measured nothing yet (a clean
# clone); started last, they ran alone on one core at the end of the ASan suite.
set_tests_properties(unit.Kernels.TheUpdatePassSumsTheNormsSquaresWithTheNormPassesBits
                     unit.Kernels.ClearingTheGradientsInThePassChangesNothingElse
                     unit.Engine.TheNormHasTheSameBitsWhicheverPassSumsIt PROPERTIES COST 60)
