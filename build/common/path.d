build/common/path.o: common/path.c common/path.h common/err.h
common/path.h:
common/err.h:
