#pragma once
#include "properties/evaluate.h"  // points up: must be reported
