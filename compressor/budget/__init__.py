"""Compress to a budget: channel groups, the search that allocates removals under the budget,
the figures it measures, and the schedule that reproduces its choice."""

from compressor.budget.groups import ChannelGroup, prunable_groups
from compressor.budget.measure import QUANTITIES, LatencySetting, figures, measure_latency
from compressor.budget.schedule import budget_schedule, schedule_text
from compressor.budget.search import Budget, BudgetSearch, SearchResult

__all__ = ["ChannelGroup", "prunable_groups", "QUANTITIES", "LatencySetting", "figures",
           "measure_latency", "budget_schedule", "schedule_text", "Budget", "BudgetSearch",
           "SearchResult"]
